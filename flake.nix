# `nix develop` for Meshnet on GPU hosts: everything tools/bazel would install on Debian, so the
# wrapper finds nothing to install, plus a GPU toolchain per shell (ADR 0014):
#   nix develop            CPU and Vulkan: the Vulkan loader and headers, SPIR-V headers, shaderc's
#                          glslc and Mesa (lavapipe, RADV, ANV), for //cpp/worker:worker_vulkan
#   nix develop .#cuda     the same plus nvcc, the CUDA runtime and cuBLAS (unfree), for NVIDIA hosts
#   nix develop .#rocm     the same plus the ROCm/HIP toolchain, rocBLAS and hipBLAS (Linux)
# nixpkgs is pinned to one exact commit (not a branch), so evidence made in these shells is made
# with the same toolchain every time. Not evaluated on the project's CI machines (no Nix store
# there); CI parses this file and checks the pin (//tools:workspace_files_test).
{
  description = "Meshnet: distributed GGUF inference (dev shells)";

  # nixos-24.05 era: Vulkan 1.3.283, shaderc 2024.x, CUDA 12.x in cudaPackages.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/afaccbbe4dd033611188abbb4b4c7c017a422e14";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f system (import nixpkgs {
        inherit system;
        config.allowUnfreePredicate = pkg: builtins.elem (nixpkgs.lib.getName pkg)
          [ "cuda_nvcc" "cuda_cudart" "cuda_cccl" "libcublas" "cuda-merged" ];
      }));
    in
    {
      devShells = forAll (system: pkgs:
        let
          # Python 3.11 with the packages of python/requirements.in (nixpkgs' versions; the
          # hash lock applies to the Debian venv).
          python = pkgs.python311.withPackages (ps: with ps; [
            torch
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
          vulkan = with pkgs; [ vulkan-loader vulkan-headers spirv-headers shaderc mesa ];
          cuda = with pkgs.cudaPackages; [ cuda_nvcc cuda_cudart cuda_cccl libcublas ];
          rocm = with pkgs.rocmPackages; [ clr hipcc rocm-device-libs rocblas hipblas ];
          shell = extra: pkgs.mkShell {
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
            ] ++ vulkan ++ extra;
            # @meshnet_python uses this interpreter instead of building a venv.
            MESHNET_PYTHON = "${python}/bin/python3";
            shellHook = ''
              export IN_NIX_SHELL=''${IN_NIX_SHELL:-impure}
            '';
          };
        in
        {
          default = shell [ ];
          cuda = shell cuda;
        } // pkgs.lib.optionalAttrs pkgs.stdenv.isLinux {
          rocm = shell rocm;
        });
    };
}
