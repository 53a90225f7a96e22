"""Helpers the test tiers share, each defined once: waiting for a condition (`waiting`), local
ports and HTTP probes (`network`), topics created and deleted on a broker (`topics`), a consumed
record's key, value and headers (`records`), small ONNX models built to break or to mismatch
(`models`), and the memory and time budget of one hostile input (`budget`)."""
