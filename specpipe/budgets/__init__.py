"""Draft budget plug-ins (how many tokens to draft per step), chosen by
`conf/budget/*.yaml`. A budget sees every step's outcome via `observe`."""
