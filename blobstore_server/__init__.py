"""The server side of the blob store, installed with `pip install 'blobstore[server]'`: the shared libraries
(`libs`), one package per process (`services`), the Spark jobs (`spark`, with the `spark` extra), the cluster's
layout, launcher and deploy bundles (`cluster`) and the operators' `blobstore` CLI (`cli`). The SDK (`blobstore`)
never imports any of it."""
