"""Checkpoint importers/exporters between this codebase and Hugging Face / original releases."""
