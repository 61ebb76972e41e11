"""Index upkeep: keeping index.faiss, and the manifest's record of what it covers, in step with
a collection's parts (save after a long add run, rebuild on request or when the collection
outgrew its index kind). Receives the derived index, the store and the manifest; hands back the
manifest to keep (`Collection.save_index`, `rebuild_index` and `close` are the entry points).
"""

from __future__ import annotations

import logging
from pathlib import Path

from faste_mm.indexers.crash_points import crash_point
from faste_mm.indexers.derived_index import DerivedIndex, desired_factory, max_part
from faste_mm.indexers.manifest import Manifest, write_manifest
from faste_mm.indexers.store import MetaStore

log = logging.getLogger(__name__)


def save(root: Path, derived: DerivedIndex, store: MetaStore, manifest: Manifest) -> Manifest:
    """Write index.faiss (current: the caller brought it up to date), then the manifest naming it."""
    digest = derived.save()
    crash_point("index-after-replace")
    # Manifest after the index file: a crash in between leaves a manifest describing an
    # older index, whose checksum the new file fails on loading, so the index is rebuilt.
    epoch, covered = derived.key
    manifest = manifest.replace(index_factory=derived.factory, index_epoch=epoch, index_max_part=covered,
                                index_sha256=digest, counts=store.counts())
    write_manifest(root, manifest)
    return manifest


def rebuild(derived: DerivedIndex, store: MetaStore, manifest: Manifest) -> None:
    """Build the index `manifest` asks for over every committed part, in memory (`save` writes it)."""
    committed = store.parts()
    derived.build(store.state()["epoch"], committed, desired_factory(manifest, committed), manifest)


def at_close(root: Path, derived: DerivedIndex, store: MetaStore, saved: Manifest, manifest: Manifest) -> str | None:
    """What a writer's close must do: "rebuild" (the collection outgrew its index kind), "save"
    (parts written since index.faiss was saved), "counts" (only the manifest's counts are behind)
    or None."""
    committed = store.parts()
    key = (store.state()["epoch"], max_part(committed))
    desired = desired_factory(manifest, committed)
    if committed and (derived.factory or saved.index_factory) != desired:
        log.info("%s: index type changes to %s for %d vectors", root, desired, sum(n for _, n in committed))
        return "rebuild"
    if (saved.index_epoch, saved.index_max_part) != key and committed:
        return "save"
    if saved.counts != store.counts():
        return "counts"
    return None
