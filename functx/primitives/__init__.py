"""The primitive set. Each module defines a family of primitives with all of
their rules; importing this package registers them all."""

from . import common  # noqa: F401
from . import elementwise  # noqa: F401
from . import structural  # noqa: F401
from . import reductions  # noqa: F401
from . import dot  # noqa: F401
from . import indexing  # noqa: F401
from . import sort  # noqa: F401
from . import call  # noqa: F401
from . import conv  # noqa: F401
from . import control  # noqa: F401
from . import random_prims  # noqa: F401
from . import linalg  # noqa: F401
from . import complex  # noqa: F401
from . import fft  # noqa: F401
from . import windows  # noqa: F401
from . import custom  # noqa: F401
from . import misc  # noqa: F401
from . import callback  # noqa: F401
from . import collectives  # noqa: F401
