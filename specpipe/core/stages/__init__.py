"""The five stages of a speculative step, one module each: draft -> verify -> compare -> rollback -> bonus.
Their protocols are in `core/protocols.py`; plug-ins live in `drafters/`, `rollbacks/`, `budgets/`;
`core/step.py` runs them over a step's rows, driven by `core/pipeline.py` (the CLI) and `batch/decoder.py`
(the server)."""
