cd bench && ../.venv/bin/python soak.py --fleet 3 --runs 300 --samples 100000 --kills 60 --db-restarts 2 --seed 29 --json /work/notes/soak/fleet-29.json --max-seconds 2400 --drain-seconds 900
