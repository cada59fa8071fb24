"""Storing an ended prompt's outputs: fetched, cleaned of metadata, hashed, stored, recorded.

Each output is recorded on the job as soon as its blob is stored, so a stored blob is never
left unrecorded by a worker that dies before the job finishes (recording them all in one step
after the last copy would spare a call an output, and leave every earlier copy unrecorded
should the worker die in a later one).

An output in a format reckon cannot clean (``pipeline/providers/media.py`` ``CLEANED``) and the
operator does not allow (``RECKON_OUTPUT_UNCLEANED_TYPES``) is never stored; the others are, and
the caller fails the job with the summary ``store_outputs`` returns (docs/operations.md
"Outputs reckon cannot clean").
"""

from __future__ import annotations

from typing import Any

from pipeline.blobs import Blobs
from pipeline.claims import Claim
from pipeline.errors import OutputRefused
from pipeline.providers.base import OutputRef, Provider
from pipeline.providers.media import describe
from pipeline.state.store import Store
from pipeline.work.leases import Held

#: The job's ``error_reason`` when an output was refused.
REFUSED_REASON = "output_not_cleanable"


def store_outputs(store: Store, blobs: Blobs, claim: Claim, provider: Provider, refs: list[OutputRef],
                  heartbeat: Held, *, uncleaned: frozenset[str] = frozenset()) -> dict[str, str] | None:
    """Store and record every output of ``refs`` that can be cleaned (or is allowed as it is);
    None if all were, else a safe summary of the refused ones (indices and content type, no name)."""
    refused: list[tuple[int, str]] = []
    for ref in refs:
        heartbeat.check()
        try:
            data, content_type = describe(provider.fetch(ref), ref.filename, uncleaned=uncleaned)
        except OutputRefused as exc:  # never stored as it came: it may carry the workflow
            refused.append((ref.index, exc.content_type))
            heartbeat.progress()
            continue
        digest = blobs.put(data)
        record: dict[str, Any] = {"sha256": digest, "bytes": len(data), "content_type": content_type}
        heartbeat.check()  # given up by the keeper while it fetched: the reconciler records it
        store.store_output(claim, ref.index, record)
        heartbeat.progress()
    return refusal(refused) if refused else None


def refusal(refused: list[tuple[int, str]]) -> dict[str, str]:
    """The job error's detail for refused outputs: the first one's index and content type, and every index."""
    index, content_type = refused[0]
    return {"error_type": REFUSED_REASON, "output_index": str(index), "content_type": content_type[:100],
            "output_indices": ",".join(str(i) for i, _ in refused),
            "message": f"output {index} is {content_type[:100]}, whose metadata reckon cannot remove; it is not "
                       "stored (an operator may allow the type with RECKON_OUTPUT_UNCLEANED_TYPES)"}
