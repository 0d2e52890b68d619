"""`specpipe-serve`: an OpenAI-compatible HTTP server over one speculative Session."""
