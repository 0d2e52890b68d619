"""What a run is configured by: the schemas (`schema.py`: types and ranges; the values live in specpipe/conf/),
a group option read in-process (`config_groups.py`), the user's config folder (`user_config.py`), the
`_target_`s a config may name (`plugin_targets.py`), what a preset or shared file may change (`shared_config.py`,
`yaml_data.py`), model size bounds (`size_bounds.py`), checks before any load (`preflight.py`) and a run folder's
config read back as data (`snapshot.py`). Nothing here loads a model or runs a step.
"""
