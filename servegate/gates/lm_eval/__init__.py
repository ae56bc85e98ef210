"""The lm-evaluation-harness adapter: servegate as an lm-eval model, and suites that are lm-eval tasks (an
optional extra, imported only for an lm-eval suite)."""
