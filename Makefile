# flwr-fedeval: every target sets up .venv (Python 3.11) on first use.
SHELL := /bin/bash
.DEFAULT_GOAL := help
NUM_CLIENTS ?= 5
XRAY_DIR ?= ../shared/data/chest-xray
BANK_DIR ?= ../shared/data/bank-marketing

.PHONY: help setup run run-plain run-deployment run-xray run-shapley test test-fast test-openfhe lint bench clean

help:
	@echo "make run        main job, private: xMK-CKKS training + FHE AUC (malicious) on the embedded breast-cancer data ($(NUM_CLIENTS) clients)"
	@echo "make run-plain  the plaintext baseline of the main job (FedAvg + the server sums plaintext counts)"
	@echo "make run-deployment  main job on a local deployment engine: SuperLink + $(NUM_CLIENTS) SuperNodes, TLS, no Ray"
	@echo "make run-xray   main job on the chest X-rays in $(XRAY_DIR) (seed CNN, pneumonia vs normal)"
	@echo "make run-shapley secure Shapley values (SecSV) on bank marketing in $(BANK_DIR): $(NUM_CLIENTS) clients + aux server"
	@echo "make run-openfhe main job, FHE AUC (FHE_AUC=malicious|semi-honest) on OpenFHE: Python 3.10 venv, flwr 1.30"
	@echo "make test       the whole test suite (what CI runs)"
	@echo "make test-fast  the suite without tests marked slow"
	@echo "make lint       ruff and mypy (a leg of make test)"
	@echo "make bench      the benchmarks (JSON in benchmarks/results/)"

setup:
	@scripts/bootstrap.sh

# RUN_CONFIG="key=value ..." overrides any key, also one a target sets (the later value wins);
# run-local.sh checks config, data and every client's split before Flower starts, and gives
# each run its own SuperLink (own FLWR_HOME and port), so two runs can go at once.
# The main job is private by default: xMK-CKKS secure aggregation and the FHE AUC (malicious
# protocol); `make run-plain` is the plaintext baseline (FedAvg, the server sums plaintext counts).
PRIVATE_CONFIG := secure-aggregation='xmkckks' auc-method='fhe' fhe-auc='malicious'
run: setup
	@scripts/run-local.sh $(NUM_CLIENTS) "$(PRIVATE_CONFIG)" $(if $(RUN_CONFIG),"$(RUN_CONFIG)")

run-plain: setup
	@scripts/run-local.sh $(NUM_CLIENTS) $(if $(RUN_CONFIG),"$(RUN_CONFIG)")

run-deployment: setup
	@scripts/run-deployment.sh $(NUM_CLIENTS) $(if $(RUN_CONFIG),"$(RUN_CONFIG)")

run-xray: setup
	@scripts/run-local.sh $(NUM_CLIENTS) "dataset='chest-xray' data-dir='$(abspath $(XRAY_DIR))' local-epochs=2 decision-point-spacing='logit'" $(if $(RUN_CONFIG),"$(RUN_CONFIG)")

# SecSV runs only where every node accepts an honest-but-curious principal server P (README, Threat
# model): this demo writes fedeval-secsv-trust-principal = true into each simulated node's policy file.
run-shapley: setup
	@ROOT="$(CURDIR)" PATH="$(CURDIR)/.venv/bin:$$PATH" && . scripts/identities.sh && \
	  ensure_identities $$(( $(NUM_CLIENTS) + 1 )) && for i in $$(seq 0 $(NUM_CLIENTS)); do \
	    sed -i 's/^fedeval-secsv-trust-principal = .*/fedeval-secsv-trust-principal = true/' "$$IDS/node-$$i.policy.toml"; \
	    grep -qs '^fedeval-secsv-trust-principal = true' "$$IDS/node-$$i.policy.toml" || \
	    echo 'fedeval-secsv-trust-principal = true' >> "$$IDS/node-$$i.policy.toml"; done
	@scripts/run-local.sh $$(( $(NUM_CLIENTS) + 1 )) "dataset='bank-marketing' data-dir='$(abspath $(BANK_DIR))' model='logreg' partitioning='dirichlet' dirichlet-alpha=0.5 num-server-rounds=10 local-epochs=1 batch-size=64 learning-rate=0.01 shapley='secsv' shapley-feature-bound=1.0 shapley-model-bound=32.0 shapley-aux-partition-id=$(NUM_CLIENTS) min-nodes=$(NUM_CLIENTS)" $(if $(RUN_CONFIG),"$(RUN_CONFIG)")

test: setup
	@scripts/run-tests.sh

lint: setup
	@scripts/lint.sh

# two pytest workers (pytest-xdist): the fast loop is CPU-bound protocol tests, 2 cores here
test-fast: setup
	@scripts/run-tests.sh -m "not slow" -n 2

bench: setup
	@for b in benchmarks/bench_*.py; do echo "== $$b"; .venv/bin/python $$b || exit 1; done

clean:
	rm -rf .flwr-home .flwr-deploy outputs .pytest_cache .fedeval-ids

# --- Python 3.10 / flwr 1.30 / OpenFHE: the [openfhe] extra in its own venv (.venv-py310) ---
.PHONY: run-openfhe test-openfhe test-wheel
FHE_AUC ?= malicious

run-openfhe:  ## main job with the FHE AUC phase on OpenFHE (builds .venv-py310: Python 3.10, flwr 1.30)
	@scripts/bootstrap-py310.sh
	@RUN_VENV=.venv-py310 RUN_FLWR_HOME="$(CURDIR)/.flwr-home-py310" OMP_NUM_THREADS=1 \
	  scripts/run-local.sh $(NUM_CLIENTS) "auc-method='fhe' fhe-backend='openfhe' fhe-auc='$(FHE_AUC)'" $(if $(RUN_CONFIG),"$(RUN_CONFIG)")

test-openfhe:  ## the Python 3.10 / flwr 1.30 / OpenFHE CI leg
	@scripts/test-openfhe.sh

test-wheel:  ## the core wheel (no extras) in a clean Python 3.12 venv
	@scripts/test-wheel.sh
