"""``python -m jaxgossip.cli``: the ``jaxgossip`` console script."""

import sys

from jaxgossip.cli import main

sys.exit(main())
