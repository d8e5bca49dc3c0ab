"""The engine: the one loop that runs every tape, private to tapekit.

- :mod:`~tapekit._engine.moves`: the move rule (:class:`Move`, :func:`next_move`): who moves
  next on a tape, read from the tape alone.
- :mod:`~tapekit._engine.turn`: the agent's turn (node runs until an action), the LLM call, and
  finishing a node run the tape was cut inside.
- :mod:`~tapekit._engine.forks`: a fork's branches run concurrently, joined in branch order.
- :mod:`~tapekit._engine.loop`: :func:`alternate`, agent turns and environment reactions on one
  tape, for a session (``amain_loop``) and for each fork branch alike.
- :mod:`~tapekit._engine.runs`: small pure helpers on node runs and tapes.

Imports run one way: ``loop`` → ``turn`` → ``forks`` → ``moves`` → ``runs``; the turn hands the
loop to the forks it runs, so no module imports one above it.
"""

from tapekit._engine.loop import alternate as alternate
from tapekit._engine.loop import turn as turn
from tapekit._engine.moves import Move as Move
from tapekit._engine.moves import next_move as next_move
from tapekit._engine.moves import no_environment as no_environment
