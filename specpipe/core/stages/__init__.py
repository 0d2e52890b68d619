"""The five stages of a speculative step, one protocol per module:
draft -> verify -> compare -> rollback -> bonus. Plug-ins live in
`drafters/`, `rollbacks/`, `budgets/`; `pipeline.py` wires them."""
