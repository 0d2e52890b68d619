"""`specpipe-tune`: the fastest lossless drafter and budget for the user's prompts on this machine, as a preset."""
