cd /tmp/soakcode-856a1a4 && PYTHONPATH=/tmp/soakcode-856a1a4/daemon /work/main/.venv/bin/python bench/soak.py --mode daemon --seed 52 --json bench/results/soak-daemon-follow-seed52.json
