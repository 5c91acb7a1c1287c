"""The server side of the blob store, installed with `pip install 'blobstore[server]'`: the shared libraries
(`libs`), one package per process (`services`), the Spark jobs (`spark`, with the `spark` extra) and the operators'
`blobstore` CLI with the cluster launcher (`admin`). The SDK (`blobstore`) never imports any of it."""
