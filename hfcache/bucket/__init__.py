"""Caches in object storage (S3 and every store speaking its API): ``hfcache push s3://BUCKET/PREFIX`` and
``hfcache pull s3://BUCKET/PREFIX``. The bucket layout (:mod:`.layout`) is content-addressed: each blob once under its
etag, each snapshot a small manifest written after its blobs, each ref written last (docs/fleet.md).

Needs the ``s3`` extra (boto3): ``pip install 'hfcache[s3]'``.
"""
