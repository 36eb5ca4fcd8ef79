// Command node is one rendezvous node: it joins one round, publishes "go" under node/<rank>,
// reads every rank's value and prints one JSON line, then exits 0. On a rendezvous error it
// prints a JSON line with "error" and exits 2; on bad usage it exits 64.
//
//	go run ./cmd/node 'etcd://127.0.0.1:2379/my-run?min_nodes=2&max_nodes=2'
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"time"

	rdzv "github.com/rdzv/rdzv/bindings/go"
)

type roundLine struct {
	Lang      string   `json:"lang"`
	Rank      uint32   `json:"rank"`
	WorldSize uint32   `json:"world_size"`
	Round     uint64   `json:"round"`
	Peers     []string `json:"peers"`
}

type errorLine struct {
	Lang    string `json:"lang"`
	Error   string `json:"error"`
	Message string `json:"message"`
}

func run(ctx context.Context, url string) (roundLine, error) {
	params, err := rdzv.ParamsFromURL(url)
	if err != nil {
		return roundLine{}, err
	}
	defer params.Close()
	node, err := rdzv.NewRendezvous(params)
	if err != nil {
		return roundLine{}, err
	}
	defer node.Close()
	info, store, err := node.Next(ctx)
	if err != nil {
		return roundLine{}, err
	}
	defer store.Close()
	if err := store.Set(ctx, fmt.Sprintf("node/%d", info.Rank), []byte("go")); err != nil {
		return roundLine{}, err
	}
	keys := make([]string, info.WorldSize)
	for i := range keys {
		keys[i] = fmt.Sprintf("node/%d", i)
	}
	values, err := store.MultiGet(ctx, keys, 60*time.Second)
	if err != nil {
		return roundLine{}, err
	}
	line := roundLine{Lang: "go", Rank: info.Rank, WorldSize: info.WorldSize, Round: info.Round}
	for _, v := range values {
		line.Peers = append(line.Peers, string(v))
	}
	return line, nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: node URL")
		os.Exit(64)
	}
	// Ctrl-C cancels a blocked Next: the node withdraws from the round cleanly.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	line, err := run(ctx, os.Args[1])
	out := json.NewEncoder(os.Stdout)
	if err != nil {
		e := errorLine{Lang: "go", Error: "error", Message: err.Error()}
		var rerr *rdzv.Error
		if errors.As(err, &rerr) {
			e.Error, e.Message = rerr.Status.String(), rerr.Message
		}
		_ = out.Encode(e)
		stop()
		os.Exit(2)
	}
	_ = out.Encode(line)
}
