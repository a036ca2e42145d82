cd /tmp/soakcode-532b52a && PYTHONPATH=/tmp/soakcode-532b52a/daemon /work/main/.venv/bin/python bench/soak.py --mode daemon --seed 58 --json bench/results/soak-daemon-follow-seed58.json
