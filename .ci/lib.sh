# Sourced by .ci/tidy and .ci/goget. The module list comes from go.work: a
# new module (contrib/migrate, say) is one `use` line there and nothing here.
# Published modules are the root and every module under contrib/; the others
# (bench/) are checked for tidiness but never tagged or fetched.

# workspace_modules prints the directories go.work uses, one a line, without "./".
workspace_modules() {
  GOWORK="$PWD/go.work" go work edit -json | sed -n 's/^.*"DiskPath": "\(.*\)".*$/\1/p' | sed 's#^\./##; s#/$##' | grep -v '^\.\?$'
}

# module_path DIR prints the module path declared in DIR/go.mod.
module_path() { sed -n 's/^module[[:space:]]*//p' "$1/go.mod" | head -1; }

# library_version prints the one version of github.com/pgxlock/pgxlock that
# every workspace module requires (the next or the current release); it
# fails if they disagree, require a pseudo-version, or go.work does not
# pin that version to the checkout.
library_version() {
  local d v vs=()
  for d in $(workspace_modules); do
    v=$(GOWORK=off go mod edit -json "$d/go.mod" | tr -d '\n\t ' | grep -o '"Path":"github.com/pgxlock/pgxlock","Version":"[^"]*"' | sed 's/.*"Version":"\(.*\)"/\1/')
    [ -n "$v" ] || { echo "$d/go.mod does not require github.com/pgxlock/pgxlock" >&2; return 1; }
    vs+=("$v")
  done
  v=$(printf '%s\n' "${vs[@]}" | sort -u)
  if [ "$(printf '%s\n' "$v" | wc -l)" -ne 1 ]; then
    echo "the workspace modules require different versions of github.com/pgxlock/pgxlock: $(echo $v)" >&2; return 1
  fi
  if ! [[ "$v" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "github.com/pgxlock/pgxlock is required at $v, not a release version vX.Y.Z" >&2; return 1
  fi
  if ! go work edit -json | tr -d '\n\t ' | grep -q "\"Old\":{\"Path\":\"github.com/pgxlock/pgxlock\",\"Version\":\"$v\"},\"New\":{\"Path\":\"./\"}"; then
    echo "go.work does not replace github.com/pgxlock/pgxlock $v => ./ (bump it with the requirements: RELEASING.md)" >&2; return 1
  fi
  echo "$v"
}

# serve_tagged_copy SCRATCH VERSION: what a consumer sees after a release of
# HEAD as VERSION. A bare clone of HEAD in SCRATCH/origin.git, tagged VERSION
# and <contrib dir>/VERSION for each published contrib module (any such tags
# the clone brought are moved to HEAD), and an environment in which the go
# command fetches github.com/pgxlock/* from it through git (GOPRIVATE: no
# proxy, no checksum database; git's url.insteadOf in a private global git
# config) and everything else from the Go proxy, with the local module cache
# as a first, offline, proxy. The module cache is a private one, so the
# simulated release never lands in the developer's cache: ci_modcache's,
# kept between runs (a stable path keeps the build cache warm) with its
# github.com/pgxlock/* entries removed first. Uncommitted changes are not in
# the copy.
serve_tagged_copy() {
  local scratch=$1 version=$2 d cache proxy
  git clone -q --bare . "$scratch/origin.git"
  git -C "$scratch/origin.git" tag -f "$version" HEAD >/dev/null
  for d in $(workspace_modules); do
    case "$d" in contrib/*) git -C "$scratch/origin.git" tag -f "$d/$version" HEAD >/dev/null ;; esac
  done
  cat > "$scratch/gitconfig" <<CFG
[url "file://$scratch/origin.git"]
	insteadOf = https://github.com/pgxlock/pgxlock
[protocol "file"]
	allow = always
CFG
  cache=$(go env GOMODCACHE)
  proxy=$(go env GOPROXY)
  export GIT_CONFIG_GLOBAL="$scratch/gitconfig" GIT_CONFIG_NOSYSTEM=1
  export GIT_ALLOW_PROTOCOL=file:https:ssh
  export GOPRIVATE=github.com/pgxlock/* GONOSUMDB=github.com/pgxlock/* GONOPROXY=github.com/pgxlock/*
  export GOWORK=off GOFLAGS=-mod=mod
  # The go command indexes the module cache by module path and version,
  # trusting that a version's files never change; each simulated release
  # re-tags HEAD as the same version, so the index would list the files of
  # an earlier one (a consumer build then missed pooltx/reset.go). Without
  # the index the build cache still keys on the files' contents.
  export GODEBUG="${GODEBUG:+$GODEBUG,}goindex=0"
  export GOPROXY="file://$cache/cache/download,$proxy"
  ci_modcache
  export GOMODCACHE="$CI_MODCACHE"
}

# ci_modcache sets CI_MODCACHE to the private module cache of .ci/tidy and
# .ci/goget (PGXLOCK_CI_MODCACHE, else under TMPDIR), after taking its lock
# (held until the calling shell exits: one such script at a time) and
# removing the github.com/pgxlock/* modules a previous simulated release
# left in it.
ci_modcache() {
  local c=${PGXLOCK_CI_MODCACHE:-${TMPDIR:-/tmp}/pgxlock-ci-modcache-$(id -u)} d
  CI_MODCACHE=$c
  mkdir -p "$c"
  exec 9>"$c.lock"
  flock 9
  # cache/vcs holds the git clones of direct fetches: only github.com/pgxlock/*.
  for d in "$c/github.com/pgxlock" "$c/cache/download/github.com/pgxlock" "$c/cache/vcs"; do
    if [ -e "$d" ]; then chmod -R u+w "$d"; rm -rf "$d"; fi
  done
}

# clean_scratch SCRATCH removes the scratch directory (not the module cache).
clean_scratch() {
  rm -rf "$1"
}
