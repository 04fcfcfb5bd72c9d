# Sourced by the scripts that time meshtensor against a PyTorch peer (run from the repository
# root): installs Debian's python3-torch and python3-numpy if missing, builds the default preset,
# and sets `python` (Debian's interpreter, the one python3-torch installs for) and `bin` (the
# command-line tool).
python=/usr/bin/python3
bash scripts/install-deps.sh python3-torch python3-numpy
bash scripts/build.sh default >/dev/null
bin=build/src/meshtensor
