"""The dashboard at ``/ui``: server-rendered pages over the same use cases."""
