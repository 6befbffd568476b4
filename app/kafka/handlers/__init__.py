"""One module per API family; each `handle(context, request)` returns the response (None: none is
sent, as for Produce with acks=0), built with kio's class of the request's version."""
