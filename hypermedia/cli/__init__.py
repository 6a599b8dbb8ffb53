"""The command line: thin commands over the same use cases the API calls."""
