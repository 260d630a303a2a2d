#!/usr/bin/env python3
"""A guessing game served over echelon's http-env protocol, with Python's standard library only.

    python3 examples/guess_env.py --port 8765 --log episodes.jsonl

then train against it:

    task: {name: http-env, server: "http://127.0.0.1:8765", max_turns: 3}

The game: a secret number 1-9 drawn from the episode's seed; three guesses. A right guess scores 1
and ends the episode; a wrong guess that is a number 1-9 scores 0.1 and is answered "higher" or
"lower"; anything else scores 0. Each observation shows the guesses so far, so the policy sees
the whole game in every turn's prompt.

Protocol (every request and answer is a JSON object, POSTed):
    /reset  {"seed": N}                      -> {"session": ID, "observation": TEXT}
    /step   {"session": ID, "action": TEXT}  -> {"observation": TEXT, "reward": R, "done": B,
                                                 "metrics": {NAME: NUMBER}}  (metrics: optional)
    /close  {"session": ID}                  -> {}   (an episode cut short by echelon)
The game is deterministic in (seed, actions), as the protocol requires: the learner replays
every episode it trains on.

With --log, every finished or closed episode is appended as one JSON line:
    {"seed": N, "actions": [...], "rewards": [...], "reward": SUM, "done": B}
"""
import argparse
import json
import random
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_GUESSES = 3


class Game:
    def __init__(self, seed):
        self.seed = seed
        self.secret = random.Random(seed).randint(1, 9)
        self.actions = []
        self.rewards = []
        self.history = []

    def observation(self):
        lines = ["Guess my number (1-9)."] + self.history + ["Guess:"]
        return "\n".join(lines)

    def step(self, action):
        guess = action.strip()[:1]
        self.actions.append(action)
        done = len(self.actions) >= MAX_GUESSES
        if guess.isdigit() and 1 <= int(guess) <= 9:
            if int(guess) == self.secret:
                reward, done = 1.0, True
            else:
                reward = 0.1
                self.history.append(f"{guess}: {'higher' if int(guess) < self.secret else 'lower'}")
        else:
            reward = 0.0
            self.history.append(f"{action.strip()[:8]!r}: not a number")
        self.rewards.append(reward)
        return reward, done


class Handler(BaseHTTPRequestHandler):
    games = {}
    lock = threading.Lock()
    log_path = None

    def do_POST(self):
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            answer = self.route(self.path, body)
        except (KeyError, TypeError, ValueError) as e:
            return self.reply(400, {"error": f"{type(e).__name__}: {e}"})
        if answer is None:
            return self.reply(404, {"error": f"no endpoint {self.path}"})
        self.reply(200, answer)

    def route(self, path, body):
        if path == "/reset":
            seed = body["seed"]
            if not isinstance(seed, int) or seed < 0:
                raise ValueError("seed must be a non-negative integer")
            session = uuid.uuid4().hex
            game = Game(seed)
            with self.lock:
                self.games[session] = game
            return {"session": session, "observation": game.observation()}
        if path == "/step":
            with self.lock:
                game = self.games[body["session"]]
            reward, done = game.step(str(body["action"]))
            if done:
                self.end_episode(body["session"], done=True)
                return {"observation": "", "reward": reward, "done": True, "metrics": {"guesses": len(game.actions)}}
            return {"observation": game.observation(), "reward": reward, "done": False}
        if path == "/close":
            self.end_episode(body["session"], done=False)
            return {}
        return None

    def end_episode(self, session, done):
        with self.lock:
            game = self.games.pop(session, None)
            if game is None or self.log_path is None:
                return
            with open(self.log_path, "a") as f:
                f.write(json.dumps({"seed": game.seed, "actions": game.actions, "rewards": game.rewards,
                                    "reward": sum(game.rewards), "done": done}) + "\n")

    def reply(self, status, answer):
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0: any free port (printed on stdout)")
    parser.add_argument("--log", help="append every finished episode to this JSONL file")
    args = parser.parse_args()
    Handler.log_path = args.log
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
