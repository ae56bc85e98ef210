"""What tests in several folders share: server processes on free ports, manifests written to disk, a tiny Llama.

tests/ is on sys.path (pytest puts the folder of the root conftest.py there), so any test imports
`support.servers`, `support.manifests` or `support.models`.
"""
