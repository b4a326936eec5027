# `nix develop` for Meshnet on ROCm hosts: everything tools/bazel would install on Debian, so the
# wrapper finds nothing to install, plus the ROCm/HIP toolchain on Linux. Not evaluated on the
# project's CI machines (no Nix store there); CI only parses this file (tests:flake_parse_test).
{
  description = "Meshnet: distributed GGUF inference (dev shell)";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-24.05";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f system nixpkgs.legacyPackages.${system});
    in
    {
      devShells = forAll (system: pkgs:
        let
          # Python 3.11 with the packages of python/requirements.in (nixpkgs' versions; the
          # hash lock applies to the Debian venv). torch is nixpkgs' ROCm build on Linux.
          python = pkgs.python311.withPackages (ps: with ps; [
            (if pkgs.stdenv.isLinux then torchWithRocm else torch)
            transformers
            accelerate
            gguf
            numpy
            grpcio
            grpcio-tools
            protobuf
            pytest
            psutil
          ]);
          rocm = with pkgs.rocmPackages; [ clr hipcc rocm-device-libs rocblas hipblas ];
        in
        {
          default = pkgs.mkShell {
            packages = with pkgs; [
              bazel_7
              grpc
              protobuf
              gtest
              abseil-cpp
              openssl
              pkg-config
              git
              gcc
              nix
              python
              iproute2  # tests/multihost: hosts as network namespaces
              nftables  # and their NAT
              iputils  # and per-link RTT (ping)
              postgresql  # the PostgreSQL ledger's tests (issue 20)
              etcd  # the etcd tracker store's tests (issue 20)
            ] ++ pkgs.lib.optionals pkgs.stdenv.isLinux rocm;
            # @meshnet_python uses this interpreter instead of building a venv.
            MESHNET_PYTHON = "${python}/bin/python3";
            shellHook = ''
              export IN_NIX_SHELL=''${IN_NIX_SHELL:-impure}
            '';
          };
        });
    };
}
