"""Python's rooms: which python/meshnet/<room>/ packages each room's library may import.

One table, two fences, both in the build:
- Bazel visibility: a room's libraries are visible only to the rooms that list it (in `imports`
  or `test_imports`), to //python (the binaries), //tests and //tools. A `deps` entry across
  rooms that the table does not allow fails analysis.
- tools/rooms/check_imports.py: `role_library` runs it on the library's modules as a build
  action, so an `import meshnet.<room>` that the table does not allow fails `bazel build`, even
  where the runfiles happen to hold that module.

Names in the lists: rooms (packages under python/meshnet/), the shared modules of
python/meshnet/ (process, memory_cap, http_bounds, peers, webserver), and generated protobuf packages
(`shard.v1`: only the protocol room, which converts them to native types, may import those).
`test_imports` adds what a room's tests (not its library) may depend on.

The direction matters where two rooms meet: the bench measures certification (bench -> certify)
and certification never imports the bench; the gateway, the swarm, certification and the
verifier share the text room, not the gateway's internals.
"""

_BASE = ["process"]

ROOMS = {
    "wire": struct(imports = [], test_imports = []),
    "text": struct(imports = [], test_imports = []),
    "recipe": struct(imports = [], test_imports = []),
    # The placement planner (issue 51): a pure function, no other room (DESIGN: its own room).
    "placement": struct(imports = [], test_imports = []),
    "protocol": struct(
        imports = ["wire", "identity", "diag.v1", "shard.v1", "tracker.v1"],
        # readers_test reads the sources of every room that speaks the seam.
        test_imports = ["client", "node", "swarm", "tracker", "verify"],
    ),
    "identity": struct(imports = _BASE + ["protocol", "wire"], test_imports = []),
    # Weights from peers (issue 50): signed manifests of a model's parts, pieces fetched and checked.
    "weights": struct(imports = _BASE + ["identity", "peers", "recipe", "weights.v1"], test_imports = []),
    "relay": struct(imports = _BASE + ["identity", "peers", "relay.v1"], test_imports = ["protocol"]),
    "client": struct(imports = _BASE + ["identity", "protocol", "wire"], test_imports = []),
    "reference": struct(
        imports = _BASE + ["identity", "protocol", "recipe", "wire"],
        test_imports = [],
    ),
    "tracker": struct(
        imports = _BASE + ["identity", "peers", "protocol", "recipe", "relay", "webserver", "weights", "wire",
                           "tracker.v1", "weights.v1"],
        test_imports = [],
    ),
    "node": struct(
        imports = _BASE + ["identity", "protocol", "recipe", "reference", "relay", "webserver", "weights", "wire"],
        test_imports = [],
    ),
    "gateway": struct(
        imports = _BASE + ["client", "http_bounds", "identity", "protocol", "recipe", "text", "wire"],
        test_imports = [],
    ),
    "verify": struct(
        imports = _BASE + ["identity", "memory_cap", "protocol", "recipe", "text", "wire"],
        test_imports = [],
    ),
    # The swarm starts the tracker and nodes as child processes (their libraries in its runfiles).
    "swarm": struct(
        imports = _BASE + ["client", "gateway", "identity", "node", "protocol", "recipe", "text", "tracker", "wire"],
        test_imports = [],
    ),
    "certify": struct(
        imports = _BASE + ["client", "memory_cap", "recipe", "reference", "swarm", "text", "verify"],
        test_imports = ["tracker"],
    ),
    # The soak's attacker is a client too (issue 55: grammars through the client and the gateway).
    "soak": struct(
        imports = _BASE + ["client", "gateway", "identity", "protocol", "recipe", "swarm", "tracker", "wire"],
        test_imports = [],
    ),
    "bench": struct(
        imports = _BASE + [
            "certify", "client", "gateway", "identity", "memory_cap", "protocol", "recipe", "reference",
            "swarm", "tracker", "verify", "wire",
        ],
        test_imports = [],
    ),
}

# Who sees every room: the binaries' package, the cross-process tests, the tools.
_EVERYWHERE = ["//python:__pkg__", "//tests:__subpackages__", "//tools:__subpackages__"]

def room_of(package):
    """The room of a package under python/meshnet/ (its first folder), or None."""
    parts = package.split("/")
    if len(parts) < 3 or parts[0] != "python" or parts[1] != "meshnet":
        return None
    return parts[2]

def room_visibility(room):
    """Where a room's libraries may be depended on: its own tree and the rooms that list it."""
    users = [
        "//python/meshnet/%s:__subpackages__" % other
        for other, rules in ROOMS.items()
        if room in rules.imports or room in rules.test_imports
    ]
    return ["//python/meshnet/%s:__subpackages__" % room] + sorted(users) + _EVERYWHERE
