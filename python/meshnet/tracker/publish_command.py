"""`bazel run //python:publish -- --state DIR --gguf /abs/MODEL.gguf --model NAME [--nodes N |
--ranges 0:10,10:20] [--piece-mib 16]`: publishes a certified model for nodes to fetch range
by range (issue 50, item 3).

It cuts the GGUF into per-range parts (`cut_model`) under DIR/models/NAME/, and writes beside
them the manifest (weights/manifest.py) signed by the tracker's ticket key: the source's sha256,
each part's range, size and sha256, each piece's sha256. The model must already have a passed
certification in DIR/models.json for this very file (`//python:certify -- --gguf M --model NAME
--append DIR/models.json`): nothing uncertified is published. The parts are made in a directory
beside the final one and moved into place whole, so a publication that fails leaves nothing a
tracker would serve. The tracker serves what it finds under DIR/models/ when it starts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Optional

from meshnet.identity.keys import Identity
from meshnet.recipe import cut_model
from meshnet.recipe.fingerprint import artifact_fingerprint, gguf_summary
from meshnet.tracker.certified import load_models
from meshnet.tracker.state_dir import StateDir
from meshnet.weights.manifest import DEFAULT_PIECE_BYTES, MAX_PIECE_BYTES, MIN_PIECE_BYTES, from_parts_record, sign
from meshnet.weights.piece_service import MANIFEST_FILE


def certified_entry_problem(state: StateDir, model: str, artifact: str, allow_uncertified: bool = False) -> Optional[str]:
    """Why `model` from the file whose sha256 is `artifact` may not be published, or None.
    `allow_uncertified`: an entry without a passed certification will do (local test swarms, as
    the tracker's flag of that name)."""
    entries = ([m for m in load_models(state.models, allow_uncertified) if m.model == model]
               if state.models.exists() else [])
    if not entries:
        return (f"{state.models} has no certified entry named {model!r}: certify it first with "
                f"`tools/bazel run //python:certify -- --gguf GGUF --model {model} --append {state.models}`")
    if all(m.artifact_fingerprint != artifact for m in entries):
        return f"the entry {model!r} in {state.models} was certified from another file than this one ({artifact})"
    return None


def publish(state: StateDir, gguf: Path, model: str, ranges: list[tuple[int, int]], piece_bytes: int,
            progress=lambda line: None) -> Path:
    """The manifest's path once the model is published under state.published/model."""
    final = state.published / model
    if final.exists():
        raise FileExistsError(f"{final} exists: {model!r} is published already (remove it to publish again)")
    building = state.published / f".{model}.building"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    try:
        cut_model.cut(gguf, ranges, building, progress)
        (record,) = building.glob("*.parts.json")
        manifest = sign(from_parts_record(record, model, piece_bytes), Identity.load_or_create(state.ticket_key))
        (building / MANIFEST_FILE).write_bytes(manifest.encode())
        building.rename(final)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return final / MANIFEST_FILE


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Publish a certified model for nodes to fetch by range.")
    parser.add_argument("--state", type=Path, required=True, metavar="DIR", help="the directory `tracker --init` made")
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--model", required=True, help="the name its certified entry has in DIR/models.json")
    split = parser.add_mutually_exclusive_group()
    split.add_argument("--nodes", type=int, help="cut into this many even ranges")
    split.add_argument("--ranges", help="cut at these ranges: 0:10,10:20,...")
    parser.add_argument("--allow-uncertified", action="store_true",
                        help="publish a models.json entry without a passed certification (local test swarms only; "
                        "the tracker then needs its --allow-uncertified too)")
    parser.add_argument("--piece-mib", type=float, default=DEFAULT_PIECE_BYTES / (1 << 20),
                        help="piece size in MiB: the unit fetched and checked alone (default 16)")
    args = parser.parse_args(argv)
    state = StateDir(args.state)
    if state.missing():
        parser.error(f"--state {state.root}: missing {', '.join(p.name for p in state.missing())}")
    piece_bytes = int(args.piece_mib * (1 << 20))
    if not MIN_PIECE_BYTES <= piece_bytes <= MAX_PIECE_BYTES:
        parser.error(f"--piece-mib must give between {MIN_PIECE_BYTES} and {MAX_PIECE_BYTES} bytes")
    try:
        n_layer = gguf_summary(args.gguf).n_layer
        ranges = (cut_model.parse_ranges(args.ranges) if args.ranges
                  else cut_model.even_cuts(n_layer, args.nodes or min(4, n_layer)))
        print(f"hashing {args.gguf} ...", file=sys.stderr, flush=True)
        problem = certified_entry_problem(state, args.model, artifact_fingerprint(args.gguf), args.allow_uncertified)
        if problem:
            parser.error(problem)
        path = publish(state, args.gguf, args.model, ranges, piece_bytes,
                       lambda line: print(line, file=sys.stderr, flush=True))
    except (OSError, ValueError) as err:
        parser.error(str(err))
    manifest = json.loads(path.read_text())
    print(json.dumps({"model": args.model, "manifest": str(path), "artifact": manifest["artifact"],
                      "parts": [{"layers": [p["start"], p["end"]], "bytes": p["size"], "pieces": len(p["pieces"])}
                                for p in manifest["parts"]]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
