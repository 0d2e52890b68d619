"""Rollback plug-ins, chosen by `conf/rollback/*.yaml` (`_target_`)."""
