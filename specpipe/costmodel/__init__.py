"""What speculation costs on this device: the calibrated verify curve T(n)/T(1), the draft
cost and the predicted speed-up (`calibration.py`); budgets read it, nothing here decides.
"""
