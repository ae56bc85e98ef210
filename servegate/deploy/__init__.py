"""From manifest to deployment: `gate export` (an engine's own config files and what they cannot express)
and `gate verify` (a live deployment checked against the manifest, without load)."""
