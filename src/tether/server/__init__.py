"""Front doors adapting wire requests to engine calls, and the process that runs them."""
