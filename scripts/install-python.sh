#!/usr/bin/env bash
# Installs the Python package `meshtensor` of a build (default: build/) into the site directory of
# the interpreter it was built for (Debian's /usr/bin/python3: /usr/local/lib/python3.X/dist-packages;
# without root or sudo, under ~/.local). When the `python3` first on PATH is another interpreter of
# the same version (a pyenv one, say) that cannot import it, a `meshtensor.pth` in that
# interpreter's site directory adds the install directory to its path, and Debian's packages
# (NumPy) when it has no NumPy of its own: they come after its own packages.
# Usage: scripts/install-python.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
if [ ! -f "$build/python/meshtensor/__init__.py" ]; then
  echo "install-python: $build has no Python module (it needs python3-dev and pybind11-dev)" >&2
  exit 1
fi
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
interpreter=$(cache_value Python_EXECUTABLE)
relative=$(cache_value MESHTENSOR_PYTHON_INSTALL_DIR)

as_root=()
prefix=/usr/local
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo)
  else
    prefix=$HOME/.local
  fi
fi
case $relative in
  /*) site=$relative ;;
  *) site=$prefix/$relative ;;
esac
"${as_root[@]}" cmake --install "$build" --component python --prefix "$prefix" >/dev/null

# Makes `site` importable from interpreter $1 through a .pth file in its own site directory.
bridge() {
  local python=$1 own_site pth_lines
  "$python" -c "import meshtensor" >/dev/null 2>&1 && return 0
  own_site=$("$python" -c "import site, sysconfig; print(sysconfig.get_path('purelib') if '$prefix' == '/usr/local' else site.getusersitepackages())")
  pth_lines=$site
  if ! "$python" -c "import numpy" >/dev/null 2>&1; then
    pth_lines+=$'\n'$("$interpreter" -c "import numpy, os; print(os.path.dirname(os.path.dirname(numpy.__file__)))")
  fi
  "${as_root[@]}" mkdir -p "$own_site"
  printf '%s\n' "$pth_lines" | "${as_root[@]}" tee "$own_site/meshtensor.pth" >/dev/null
}

[ "$prefix" = /usr/local ] || bridge "$interpreter"
path_python=$(command -v python3 || true)
if [ -n "$path_python" ]; then
  path_executable=$("$path_python" -c "import sys; print(sys.executable)" 2>/dev/null || true)
  same_abi() {
    [ "$("$1" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")" = \
      "$("$interpreter" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")" ]
  }
  if [ -n "$path_executable" ] && [ "$(realpath "$path_executable")" != "$(realpath "$interpreter")" ]; then
    if same_abi "$path_executable"; then
      bridge "$path_executable"
    else
      echo "install-python: $path_executable is another Python version than $interpreter, which" \
           "meshtensor was built for: run scripts with $interpreter" >&2
    fi
  fi
fi
echo "meshtensor's Python package: $site/meshtensor (for $interpreter)"
