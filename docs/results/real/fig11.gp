set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set output 'docs/results/real/fig11.png'
set title 'fig11'
set xlabel 'load (share of estimated capacity)'
set ylabel 'mean TPOT (ms)'
$d0 << EOD
0.2 4.85186
0.4 5.40839
0.6 5.93133
0.8 6.40596
0.95 6.71855
EOD
$d1 << EOD
0.2 4.77765
0.4 5.34916
0.6 5.88169
0.8 6.36375
0.95 6.68201
EOD
$d2 << EOD
0.2 4.77848
0.4 5.35033
0.6 5.88176
0.8 6.36312
0.95 6.6807
EOD
$d3 << EOD
0.2 4.79692
0.4 5.35676
0.6 5.88586
0.8 6.36515
0.95 6.68425
EOD
$d4 << EOD
0.2 4.77163
0.4 5.24594
0.6 5.67082
0.8 6.0422
0.95 6.28638
EOD
$d5 << EOD
0.2 4.82751
0.4 5.3918
0.6 5.91044
0.8 6.36145
0.95 6.64042
EOD
plot $d0 using 1:2 with linespoints title 'random', $d1 using 1:2 with linespoints title 'rr', $d2 using 1:2 with linespoints title 'jsq', $d3 using 1:2 with linespoints title 'p2c', $d4 using 1:2 with linespoints title 'eldr', $d5 using 1:2 with linespoints title 'eldr-permuted'
