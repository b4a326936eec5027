"""gtest: a cc_test of one `<name>.cc` (unless srcs say otherwise) linked with gtest_main, sized
small unless told otherwise, the shape every C++ unit test here has."""

load("@rules_cc//cc:defs.bzl", "cc_test")

def gtest(name, deps = [], srcs = None, size = "small", **kwargs):
    cc_test(
        name = name,
        size = size,
        srcs = srcs if srcs != None else [name + ".cc"],
        deps = deps + ["@system_libs//:gtest_main"],
        **kwargs
    )
