"""Integrations with training frameworks: the DDP comm hook today."""
