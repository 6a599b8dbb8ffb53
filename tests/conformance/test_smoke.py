from hypermedia.queue.models import NewJob


def test_enqueue_claim_complete_roundtrip(engine):
    job_id = engine.enqueue(NewJob("debug.noop"))
    claimed = engine.claim("w1", ["bulk"], 10)
    assert [c.job_id for c in claimed] == [job_id]
