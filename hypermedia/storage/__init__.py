"""Objects and where their bytes live: keys, backends (local, S3), the ledger, GC."""
