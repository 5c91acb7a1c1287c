# Thin wrappers; each target works on a fresh machine by itself.
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup run demo test lint bench clean

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install --quiet --upgrade pip
	.venv/bin/pip install --quiet -e '.[dev]'
	touch $@

# The aws CLI (v1, from PyPI) in a venv of its own: it pins botocore exactly, as s3fs's aiobotocore does.
AWS_CLI := .venv/awscli/bin/aws
$(AWS_CLI): .venv/.installed
	python3 -m venv .venv/awscli
	.venv/awscli/bin/pip install --quiet 'awscli>=1.34,<2'

# Debian packages, as command:package[,package...]: redis-server (the volume cache), a JDK and Maven (Kafka and
# Spark run on Java 17; Maven fetches their jars), chromium with a font and chromium-driver (the dashboard test's
# headless browser), prometheus (scrapes a cluster in one test), iproute2 and nftables (hosts as network
# namespaces, `cluster up --hosts`, and cutting links between them), e2fsprogs and mount (a test's disks of a fixed
# size: loop-mounted ext4 images), postgresql (the S3 gateway's second namespace backend; tests start their own
# server as the `postgres` user the package creates), rclone (an S3 client the gateway is tested with), tcpdump (a test
# captures a `--hosts` cluster's bridge to show nothing crosses it in clear). Only what is
# missing is installed.
DEBIAN_TOOLS := redis-server:redis-server java:openjdk-17-jre-headless mvn:maven \
	chromium:chromium,fonts-liberation chromedriver:chromium-driver prometheus:prometheus ip:iproute2 nft:nftables \
	mkfs.ext4:e2fsprogs losetup:mount pg_ctlcluster:postgresql rclone:rclone tcpdump:tcpdump

# Then the jars (Kafka's broker, Spark's Kafka source and S3A connector) into ~/.cache/blobstore, once: nothing downloads at run time.
setup: .venv/.installed $(AWS_CLI)
	@missing="$$(for pair in $(DEBIAN_TOOLS); do command -v $${pair%%:*} >/dev/null || echo $${pair#*:}; done)"; \
	if [ -n "$$missing" ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends $$(echo $$missing | tr , ' '); fi
	$(PY) -m blobstore_server.cluster.kafka_broker fetch
	$(PY) deploy/spark/jars.py

# One blobnode, signed and checked: its keys derive from run/secret (generated once, mode 0600), added to the
# template deploy/blobnode.json in run/blobnode1/conf.json.
run: setup
	.venv/bin/blobstore auth config blobnode deploy/blobnode.json --secret-file run/secret -o run/blobnode1/conf.json
	$(PY) -m blobstore_server.services.blobnode -c run/blobnode1/conf.json

# A whole local cluster in ./run/, one real file stored, read back and deleted; the cluster is left running.
demo: setup
	.venv/bin/blobstore cluster down >/dev/null 2>&1 || true
	.venv/bin/blobstore cluster up
	head -c 10485760 /dev/urandom > run/demo.bin
	@echo "--- put run/demo.bin (10 MiB of random bytes)"
	.venv/bin/blobstore put run/demo.bin > run/demo.location
	@echo "--- location: $$(cat run/demo.location)"
	.venv/bin/blobstore stat "$$(cat run/demo.location)"
	.venv/bin/blobstore get "$$(cat run/demo.location)" -o run/demo.out
	cmp run/demo.bin run/demo.out
	@echo "--- read back byte for byte identical (cmp run/demo.bin run/demo.out)"
	.venv/bin/blobstore del "$$(cat run/demo.location)" --wait 30
	@echo "--- a GET of the deleted object must fail:"
	! .venv/bin/blobstore get "$$(cat run/demo.location)" > /dev/null
	@echo "--- the delete queue: tinker has marked the blobs deleted; it commits (lag 0) once it purged them after the safe delay (60 s)"
	.venv/bin/blobstore queue stats
	.venv/bin/blobstore cluster status
	@echo "--- the cluster keeps running; stop it with: .venv/bin/blobstore cluster down"

test: setup
	.venv/bin/ruff check .
	.venv/bin/mypy blobstore blobstore_server bench deploy
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/mypy blobstore blobstore_server bench deploy

bench: setup
	$(PY) bench/ec_codec.py
	$(PY) bench/blobnode.py
	$(PY) bench/raft.py
	$(PY) bench/clustermgr.py
	$(PY) bench/scale.py
	$(PY) bench/access.py
	$(PY) bench/sdk.py
	$(PY) bench/pipeline.py
	$(PY) bench/metrics_cost.py
	$(PY) bench/inspection.py
	$(PY) bench/availability.py
	$(PY) bench/tail.py
	$(PY) bench/partitions.py
	$(PY) bench/signing.py
	$(PY) bench/tls.py
	$(PY) bench/repair.py

clean:
	rm -rf .venv run bench/results
