"""meshnet_proto: one macro for the proto target chain of STYLE.md.

meshnet_proto(name = "shard", srcs = ["shard.proto"]) defines
  shard_proto        the .proto sources (with those of `deps`)
  shard_cc_proto     C++ messages (system protoc)
  shard_cc_grpc      C++ gRPC stubs (grpc_cpp_plugin)
  shard_py_pb2       Python messages (grpcio-tools from the locked venv)
  shard_py_pb2_grpc  Python gRPC stubs
Generated code lives only in bazel-out. The import root is //proto, so
proto/meshnet/x/v1/x.proto is imported as "meshnet/x/v1/x.proto" and yields the Python module
meshnet.x.v1.x_pb2 and the C++ header "meshnet/x/v1/x.pb.h".
"""

load("@rules_cc//cc:defs.bzl", "cc_library")

_ROOT = "proto"

def _rel_depth(package):
    # "proto/meshnet/diag/v1" -> "../../.." (back to //proto).
    depth = len(package.split("/")) - len(_ROOT.split("/"))
    return "/".join([".."] * depth) if depth else "."

def meshnet_proto(name, srcs, deps = [], visibility = None):
    pkg = native.package_name()
    if not pkg.startswith(_ROOT + "/"):
        fail("meshnet_proto must be used under //proto")
    stems = [s[:-len(".proto")] for s in srcs]
    dep_protos = [d + "_proto" for d in deps]

    native.filegroup(
        name = name + "_proto",
        srcs = srcs + dep_protos,
        visibility = visibility,
    )

    cc_outs = []
    for s in stems:
        cc_outs += [s + ".pb.h", s + ".pb.cc", s + ".grpc.pb.h", s + ".grpc.pb.cc"]
    native.genrule(
        name = name + "_cc_gen",
        srcs = [name + "_proto"],
        outs = cc_outs,
        tools = [
            "@system_libs//:bin/protoc",
            "@system_libs//:bin/grpc_cpp_plugin",
        ],
        cmd = ("$(location @system_libs//:bin/protoc) -I{root} " +
               "--cpp_out=$(GENDIR)/{root} --grpc_out=$(GENDIR)/{root} " +
               "--plugin=protoc-gen-grpc=$(location @system_libs//:bin/grpc_cpp_plugin) " +
               "{files}").format(root = _ROOT, files = " ".join(["%s/%s" % (pkg, s) for s in srcs])),
    )
    cc_library(
        name = name + "_cc_proto",
        srcs = [s + ".pb.cc" for s in stems],
        hdrs = [s + ".pb.h" for s in stems],
        strip_include_prefix = "/" + _ROOT,
        deps = [d + "_cc_proto" for d in deps] + ["@system_libs//:protobuf"],
        visibility = visibility,
    )
    cc_library(
        name = name + "_cc_grpc",
        srcs = [s + ".grpc.pb.cc" for s in stems],
        hdrs = [s + ".grpc.pb.h" for s in stems],
        strip_include_prefix = "/" + _ROOT,
        deps = [name + "_cc_proto", "@system_libs//:grpc"],
        visibility = visibility,
    )

    py_outs = [s + "_pb2.py" for s in stems]
    grpc_outs = [s + "_pb2_grpc.py" for s in stems]
    native.genrule(
        name = name + "_py_gen",
        srcs = [name + "_proto"],
        outs = py_outs + grpc_outs,
        tools = ["@meshnet_python//:grpc_python_protoc"],
        cmd = ("$(location @meshnet_python//:grpc_python_protoc) -I{root} " +
               "--python_out=$(GENDIR)/{root} --grpc_python_out=$(GENDIR)/{root} {files}").format(
            root = _ROOT,
            files = " ".join(["%s/%s" % (pkg, s) for s in srcs]),
        ),
    )
    native.py_library(
        name = name + "_py_pb2",
        srcs = py_outs,
        imports = [_rel_depth(pkg)],
        deps = [d + "_py_pb2" for d in deps],
        visibility = visibility,
    )
    native.py_library(
        name = name + "_py_pb2_grpc",
        srcs = grpc_outs,
        imports = [_rel_depth(pkg)],
        deps = [name + "_py_pb2"],
        visibility = visibility,
    )
