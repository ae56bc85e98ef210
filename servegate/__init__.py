"""servegate: make model serving checkable.

A served model is (weights, preprocess, runtime, batching, postprocess, failure policy).
servegate declares the six in one manifest, runs them, plans their capacity, gates every
optimization against the unoptimized reference form and writes the public serving note.
"""

__version__ = "0.1.0"
