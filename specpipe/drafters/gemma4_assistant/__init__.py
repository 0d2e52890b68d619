"""draft=gemma4_assistant: Gemma-4's published MTP drafters (`google/gemma-4-*-assistant`)."""
