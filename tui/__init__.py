"""specpipe-chat: a Textual chat UI that consumes the pipeline's typed event stream.

The UI never imports mlx and never reaches into the pipeline: it reads events
(`specpipe.events`) from a source (a live Session or a recorded events.jsonl).
"""
