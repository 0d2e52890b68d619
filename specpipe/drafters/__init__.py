"""Drafter plug-ins, chosen by `conf/draft/*.yaml` (`_target_`)."""
