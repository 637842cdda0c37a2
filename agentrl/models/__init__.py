"""Model builders: the offline tiny Qwen2-architecture model and tokenizer used by tests and CPU runs."""
