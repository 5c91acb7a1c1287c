"""A whole cluster, laid out and run: the cluster spec (`spec`) and the plan of every process and its config
(`plan`), the launcher that runs it on this machine, locally or with each host in a network namespace (`launcher`,
`procs`, `netns`), the per-host deploy bundles (`render`), the Kafka brokers and the auth each service, Kafka user
and Redis gets from the cluster secret (`kafka_broker`, `kafka_auth`, `redis_auth`, `service_auth`), and the
partitions the fault tests and benchmarks cut (`nemesis`). The `blobstore` CLI drives it; it never imports the CLI."""
