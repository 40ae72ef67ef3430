# integrationd: `make run` starts one replica on an embedded SQLite database;
# `make test` runs ruff, mypy --strict and the whole pytest suite.
VENV    ?= .venv
PYTHON  ?= python3
CONFIG  ?= config/example.toml
BIN     := $(VENV)/bin
PYTEST_ARGS ?=
# pytest-xdist workers for `make pytest` (0: one process, as `pytest` alone runs).
PYTEST_WORKERS ?= 2
PYTEST_ALONE_ARGS ?=

.PHONY: run secrets test lint typecheck pytest bench torture simulate simulate-mutants clean chromium galera prometheus

# What running needs (`make run`, `make secrets`): the package and its own dependencies.
$(BIN)/.installed-run: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e .
	touch $@

# Tests and benchmarks add their extras (pytest, mypy, Playwright, the peers).
$(BIN)/.installed: $(BIN)/.installed-run
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	touch $@

SECRETS := var/secrets/runtime-crm.token var/secrets/runtime-crm-results.token var/secrets/hubspot.token \
           var/secrets/hubspot-webhook.token var/secrets/outreach-webhook.token \
           var/secrets/sandbox.key var/secrets/outreach-app.pem var/secrets/admin-session.secret

# Demo credentials for the sandbox and the console (random, never committed).
var/secrets/%.token:
	@mkdir -p var/secrets && chmod 700 var/secrets
	@$(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(32))' > $@ && chmod 600 $@

# The console's session secret: kept, so a restart keeps operators signed in and every
# replica of this configuration honours the others' sessions.
var/secrets/admin-session.secret:
	@mkdir -p var/secrets && chmod 700 var/secrets
	@$(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(48))' > $@ && chmod 600 $@

# The token-bundle key ([keys] active = "sandbox": 32 random bytes as hex) and the sandbox
# Outreach app's RSA private key (its S2S binding signs app JWTs with it; the simulator
# derives the public key from the same file).
var/secrets/sandbox.key:
	@mkdir -p var/secrets && chmod 700 var/secrets
	@$(PYTHON) -c 'import secrets; print(secrets.token_hex(32))' > $@ && chmod 600 $@

var/secrets/outreach-app.pem: $(BIN)/.installed-run
	@mkdir -p var/secrets && chmod 700 var/secrets
	@$(BIN)/python -m sandbox.demo_keys > $@ && chmod 600 $@

# One random password per example operator (admin, viewer), and its argon2 hash,
# which config/example.toml reads with password_hash_file.
OPERATOR_HASHES := var/secrets/admin.password-hash var/secrets/viewer.password-hash

var/secrets/%.password-hash: $(BIN)/.installed-run
	@mkdir -p var/secrets && chmod 700 var/secrets
	@$(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(12))' > var/secrets/$*.password
	@chmod 600 var/secrets/$*.password
	@$(BIN)/integrationd hash-password --stdin < var/secrets/$*.password > $@

# Every file config/example.toml reads; each is made once and kept.
secrets: $(SECRETS) $(OPERATOR_HASHES)

# Where the configuration listens (for the banner and the readiness wait).
listen_of = $(shell $(PYTHON) -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb")).get(sys.argv[2], {}).get("listen", sys.argv[3]))' $(CONFIG) $(1) $(2))

# One replica, plus the HubSpot and Outreach simulators and the reference CRM Runtime with a
# little live traffic both ways: Lead title changes flowing to HubSpot (and receipts back),
# Prospect changes in Outreach arriving as signed webhooks and applied to the Leads.
# Both run in the background of one shell that waits for them: Ctrl-C, or SIGTERM to make
# (which make passes to this shell), drains the replica and stops the sandbox, so nothing
# is left running. The banner comes once the replica answers /readyz.
run: $(BIN)/.installed-run secrets
	$(BIN)/integrationd --config $(CONFIG) migrate
	$(BIN)/integrationd --config $(CONFIG) catalog publish --actor admin --reason "make run"
	$(BIN)/integrationd --config $(CONFIG) reconcile start --binding outreach-main --resource prospect \
	  --actor admin --reason "make run"
	$(BIN)/integrationd --config $(CONFIG) work enqueue noop --count 200
	@$(BIN)/python -m sandbox --config $(CONFIG) & SANDBOX=$$!; \
	  $(BIN)/integrationd --config $(CONFIG) run & REPLICA=$$!; \
	  trap 'kill -TERM $$REPLICA $$SANDBOX 2>/dev/null; wait $$REPLICA; wait $$SANDBOX; exit 143' INT TERM; \
	  $(BIN)/python -m sandbox.wait_ready "http://$(call listen_of,admin,127.0.0.1:8780)/readyz" && { \
	  echo ""; \
	  echo "  console: http://$(call listen_of,admin,127.0.0.1:8780)/admin/  (sign in as admin or viewer; passwords in var/secrets/admin.password, var/secrets/viewer.password)"; \
	  echo "  metrics: http://$(call listen_of,admin,127.0.0.1:8780)/metrics   service API: http://$(call listen_of,api,127.0.0.1:8781)/v1/openapi.json"; \
	  echo "  webhooks in: http://$(call listen_of,ingress,127.0.0.1:8782)/hooks/outreach-main"; \
	  echo "  stop: Ctrl-C (or SIGTERM to make): the replica drains, the sandbox stops"; \
	  echo ""; }; \
	  wait $$REPLICA; STATUS=$$?; kill -TERM $$SANDBOX 2>/dev/null; wait $$SANDBOX; exit $$STATUS

lint: $(BIN)/.installed
	$(BIN)/ruff check .

typecheck: $(BIN)/.installed
	$(BIN)/mypy

# The console's browser tests drive Debian's Chromium (never a downloaded one).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# The Galera tests start a 3-node cluster on loopback: Debian's galera-4 and rsync.
galera:
	@test -e /usr/lib/galera/libgalera_smm.so && command -v rsync >/dev/null 2>&1 || { \
	  echo "installing Debian's galera-4 and rsync for the distributed-engine tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq galera-4 rsync; }

# The metrics tests run Debian's Prometheus server and promtool against live replicas.
prometheus:
	@command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || { \
	  echo "installing Debian's prometheus for the metrics and alert-rule tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; }

# The tests marked `alone` (the torture run: chaos timed for a machine it has to itself) run
# after the others, in one process of their own (exit 5, none collected, is not a failure).
pytest: $(BIN)/.installed chromium galera prometheus
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist worksteal -m "not alone" $(PYTEST_ARGS)
	$(BIN)/pytest -m alone $(PYTEST_ALONE_ARGS) || [ $$? -eq 5 ]

test: lint typecheck pytest

bench: $(BIN)/.installed
	$(BIN)/python -m bench.kernel --backend mysql --replicas 4 --items 20000
	$(BIN)/python -m bench.kernel --backend sqlite --replicas 4 --items 20000
	$(BIN)/python -m bench.effects --replicas 4 --effects 5000
	$(BIN)/python -m bench.http_floor
	$(BIN)/python -m bench.ingress

# Issue 12's torture run: replicas SIGKILLed, frozen past their lease and restarted, a
# Galera node killed, a misbehaving provider, effects and webhooks flowing; DURATION seconds
# of chaos shared by MariaDB, Galera and one shared SQLite file. Prints one JSON line; exit 1
# if an invariant broke.
DURATION ?= 90
torture: $(BIN)/.installed galera
	$(BIN)/python -m bench.torture --duration $(DURATION)

# Issue 22's deterministic simulation (sim/, docs/simulation.md): the whole system in one
# trio run on a virtual network and clock, faults from the seed. `make simulate SEEDS=N`
# runs seeds 1..N; `make simulate SEED=S` replays one; DURATION simulated seconds of chaos
# per seed (default 30 here, whatever the torture run's default). One JSON line; exit 1
# when a seed broke a promise (stderr names the seed, the replay command and its last
# events). The long sweep (SEEDS=10000) is a nightly job, not CI.
SEEDS   ?= 20
JOBS    ?= 1
SIM_DURATION := $(if $(filter command line environment,$(origin DURATION)),$(DURATION),30)
simulate: $(BIN)/.installed
	$(BIN)/python -m sim $(if $(SEED),--seed $(SEED),--seeds $(SEEDS)) --duration $(SIM_DURATION) \
	  --jobs $(JOBS) $(if $(MUTANT),--mutant $(MUTANT),)

# Each named mutant (sim/mutants.py) applied in turn: one JSON line per mutant with
# `mutant`, `caught` and `seeds_to_catch` (at most MUTANT_SEEDS seeds each).
MUTANT_SEEDS ?= 500
simulate-mutants: $(BIN)/.installed
	$(BIN)/python -m sim.mutants --max-seeds $(MUTANT_SEEDS) --duration $(SIM_DURATION) --jobs $(JOBS)

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache .hypothesis
