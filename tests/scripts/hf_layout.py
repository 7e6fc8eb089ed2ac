"""Lay out a hub cache (or a local_dir) the way the running huggingface_hub does, from a Hub at HF_ENDPOINT.

Usage: python hf_layout.py LAYOUT TARGET REPO [REPO ...]
LAYOUT:
  classic     snapshot_download into the cache TARGET (snapshots link to the repo's blobs)
  shared      the same, then every LFS blob moved into the cache-wide store by huggingface_hub's own
              publish_blob_to_shared_store, as file_download.py does after an Xet download (>= 1.32); the local Hub
              is no Xet server, so the hash stands for the Xet hash
  nosymlinks  snapshot_download with HF_HUB_DISABLE_SYMLINKS=1 set by the caller (files copied into snapshots)
  localdir    snapshot_download(local_dir=TARGET) (hf download --local-dir)
Prints one JSON line: {"huggingface_hub": version, "shared": number of blobs published}. Exit 3 when this
huggingface_hub has no shared store (< 1.32, or the layout changed upstream): the caller says so.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import huggingface_hub
from huggingface_hub import snapshot_download

layout, target = sys.argv[1], Path(sys.argv[2])
for repo in sys.argv[3:]:
    if layout == "localdir":
        snapshot_download(repo, local_dir=target)
    else:
        snapshot_download(repo, cache_dir=target)
published = 0
if layout == "shared":
    try:
        from huggingface_hub.utils._shared_blobs import publish_blob_to_shared_store
    except ImportError:
        print(json.dumps({"huggingface_hub": huggingface_hub.__version__, "shared": None}))
        sys.exit(3)
    for blob in sorted(target.glob("models--*/blobs/*")):
        if blob.is_symlink() or len(blob.name) != 64:
            continue  # an LFS file's blob is named by its sha256; small git files are not Xet files
        data = blob.read_bytes()
        if not publish_blob_to_shared_store(blob_path=str(blob), xet_hash=hashlib.sha256(b"xet" + data).hexdigest(),
                                            cache_dir=target, expected_size=len(data)):
            sys.exit(f"publish_blob_to_shared_store refused {blob}")
        published += 1
print(json.dumps({"huggingface_hub": huggingface_hub.__version__, "shared": published}))
