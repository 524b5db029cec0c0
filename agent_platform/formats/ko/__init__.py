"""Per-language date formats (``FORMAT_MODULE_PATH``)."""
