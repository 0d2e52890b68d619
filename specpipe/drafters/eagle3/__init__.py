"""EAGLE-3 draft heads: the head (head.py), the published layouts it is read from (layouts.py)."""
