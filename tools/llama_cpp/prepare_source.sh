#!/usr/bin/env bash
# Prepares the pinned, patched llama.cpp source tree from the verified sdist.
#
# Called by the @llama_cpp repository rule (third_party/llama_cpp/repository.bzl); usable by
# hand to get the same tree for bisecting. Invariant: the tree it leaves is exactly the pinned
# commit plus the first LEVEL patches, each applied with `git am` as one commit; any mismatch
# (wrong commit, modified or extra file, a patch that does not apply) stops with a message.
#
# usage: prepare_source.sh SDIST_TAR SUBDIR COMMIT DEST LEVEL [PATCH...]
set -euo pipefail

die() { echo "llama.cpp prepare: $*" >&2; exit 1; }

[[ $# -ge 5 ]] || die "usage: prepare_source.sh SDIST_TAR SUBDIR COMMIT DEST LEVEL [PATCH...]"
sdist=$1 subdir=$2 commit=$3 dest=$4 level=$5
shift 5
patches=("$@")

[[ $level =~ ^[0-9]+$ ]] || die "patch level '$level' is not a number"
(( level <= ${#patches[@]} )) || die "patch level $level exceeds the series (${#patches[@]} patches)"

work=$(mktemp -d "${TMPDIR:-/tmp}/llama-prepare.XXXXXX")
trap 'rm -rf "$work"' EXIT
tar -xzf "$sdist" -C "$work"
checkout="$work/$subdir"
[[ -e "$checkout/.git" ]] || die "$subdir in the sdist is not a git checkout"

export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
head=$(git -C "$checkout" rev-parse HEAD) || die "cannot read HEAD of $subdir"
[[ "$head" == "$commit" ]] || die "pin mismatch: the sdist holds commit $head, the pin is $commit"
dirty=$(git -C "$checkout" status --porcelain --untracked-files=all)
[[ -z "$dirty" ]] || die "the source of $commit is modified:
$dirty"

# Turn the submodule checkout into a standalone repository at DEST.
gitdir=$(cd "$checkout" && cd "$(git rev-parse --git-dir)" && pwd)
mkdir -p "$dest"
cp -a "$checkout/." "$dest/"
if [[ -f "$checkout/.git" ]]; then  # a submodule: .git is a "gitdir:" pointer file
  rm -f "$dest/.git"
  cp -a "$gitdir" "$dest/.git"
fi
# Drop the submodule's work-tree pointer and the sdist builder's credential includes.
git config --file "$dest/.git/config" --unset core.worktree || true
for section in $(git config --file "$dest/.git/config" --name-only --get-regexp '^includeif\.' |
                 sed 's/\.path$//' | sort -u); do
  git config --file "$dest/.git/config" --remove-section "$section" || true
done
[[ "$(git -C "$dest" rev-parse HEAD)" == "$commit" ]] || die "relocated checkout lost HEAD"
[[ -z "$(git -C "$dest" status --porcelain --untracked-files=all)" ]] || die "relocated checkout is not clean"

# The pristine pin as an archive, for the patch-series test.
git -C "$dest" archive --format=tar.gz -o "$work/pin.tar.gz" "$commit"

ident=(-c user.name=meshnet -c user.email=meshnet@localhost -c commit.gpgsign=false)
for ((i = 0; i < level; i++)); do
  p=${patches[$i]}
  if ! git -C "$dest" "${ident[@]}" am --quiet --keep-cr --committer-date-is-author-date "$p" >&2; then
    git -C "$dest" am --abort >/dev/null 2>&1 || true
    die "patch $(basename "$p") does not apply to $commit plus the patches before it"
  fi
done
mv "$work/pin.tar.gz" "$dest/pin.tar.gz"
echo "llama.cpp $commit with $level of ${#patches[@]} patches at $dest" >&2
