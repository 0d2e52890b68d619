"""`specpipe-train-drafter`: an MTP head for a frozen target (`drafter.py`), trained on corpus
text and the target's own answers (`answers.py`).
"""
