"""``python -m eagle2.identity RESULTS``: the identity audit's command line (``eagle2.bench.identity``)."""

import sys

from eagle2.bench.identity import main

if __name__ == "__main__":
    sys.exit(main())
