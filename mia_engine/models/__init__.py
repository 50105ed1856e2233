"""Embedded models, built offline on first use into the model cache (``$MIA_HOME``)."""
