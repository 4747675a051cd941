"""Everything that touches SGLang internals lives under this package."""
