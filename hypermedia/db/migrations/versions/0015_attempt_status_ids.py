"""idx_attempt_status: (status, attempt_id), the oldest running attempt one index probe

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# The attempt fold asks for min(attempt_id) of the attempts still `started`.
# With (status) alone PostgreSQL at times walked the primary key from the
# oldest attempt, past every finished one (0.15-0.7 s a run at a million
# attempts, as its statistics came and went); with the id in the index the
# answer is its first entry under 'started'.  Same width as before: no cost
# to the attempt written at each claim beyond the id it already stores.


def upgrade() -> None:
    op.drop_index("idx_attempt_status", table_name="job_attempts")
    op.create_index("idx_attempt_status", "job_attempts", ["status", "attempt_id"])


def downgrade() -> None:
    op.drop_index("idx_attempt_status", table_name="job_attempts")
    op.create_index("idx_attempt_status", "job_attempts", ["status"])
